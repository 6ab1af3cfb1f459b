// Launcher detection (torchrun, Open MPI, PMI, Slurm, none), conflicts and nesting, the root
// address, and obtaining the UniqueId (variable, file written by rank 0 and awaited by the others,
// a single rank, no source at all) — all from environment maps, no real launcher.
#include "runtime/bootstrap/launch_env.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "runtime/bootstrap/test_util.h"

namespace kizuna::bootstrap {
namespace {

using testing::Contains;
using testing::In;

LaunchInfo MustDetect(const Environment& env) {
  auto r = DetectLaunch(env);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : LaunchInfo();
}

std::string DetectError(const Environment& env) {
  auto r = DetectLaunch(env);
  EXPECT_FALSE(r.ok()) << "accepted: " << r->Describe();
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  return r.status().message();
}

TEST(DetectLaunch, NoLauncherIsOneRank) {
  LaunchInfo i = MustDetect({{"HOME", "/root"}, {"PATH", "/bin"}});
  EXPECT_EQ(i.launcher, Launcher::kNone);
  EXPECT_EQ(i.rank, 0);
  EXPECT_EQ(i.size, 1);
  EXPECT_TRUE(Contains(i.Describe(), "no launcher")) << i.Describe();
}

TEST(DetectLaunch, Torchrun) {
  LaunchInfo i = MustDetect({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
                             {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"}});
  EXPECT_EQ(i.launcher, Launcher::kTorchrun);
  EXPECT_EQ(i.rank, 5);
  EXPECT_EQ(i.size, 8);
  EXPECT_EQ(i.local_rank, 1);
  EXPECT_EQ(i.local_size, 4);
  EXPECT_EQ(i.Describe(), "rank 5 of 8 (local 1 of 4), from torchrun");
}

TEST(DetectLaunch, OpenMpi) {
  LaunchInfo i = MustDetect({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                             {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_EQ(i.launcher, Launcher::kOpenMpi);
  EXPECT_EQ(i.rank, 3);
  EXPECT_EQ(i.size, 4);
  EXPECT_EQ(i.local_rank, 1);
  EXPECT_EQ(i.local_size, 2);
  EXPECT_EQ(LauncherName(i.launcher), "Open MPI");
}

TEST(DetectLaunch, Pmi) {
  LaunchInfo i = MustDetect({{"PMI_RANK", "2"}, {"PMI_SIZE", "3"}, {"MPI_LOCALRANKID", "0"}, {"MPI_LOCALNRANKS", "1"}});
  EXPECT_EQ(i.launcher, Launcher::kPmi);
  EXPECT_EQ(i.rank, 2);
  EXPECT_EQ(i.size, 3);
  EXPECT_EQ(i.local_rank, 0);
  EXPECT_EQ(i.local_size, 1);
  // Without the local variables: assume one host.
  LaunchInfo j = MustDetect({{"PMI_RANK", "2"}, {"PMI_SIZE", "3"}});
  EXPECT_EQ(j.local_rank, 2);
  EXPECT_EQ(j.local_size, 0);
}

TEST(DetectLaunch, Slurm) {
  LaunchInfo i = MustDetect({{"SLURM_PROCID", "7"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "3"}});
  EXPECT_EQ(i.launcher, Launcher::kSlurm);
  EXPECT_EQ(i.rank, 7);
  EXPECT_EQ(i.size, 16);
  EXPECT_EQ(i.local_rank, 3);
  EXPECT_EQ(i.local_size, 0);
  EXPECT_TRUE(Contains(i.Describe(), "from Slurm")) << i.Describe();
}

TEST(DetectLaunch, MalformedValuesNameTheVariable) {
  EXPECT_TRUE(Contains(DetectError({{"RANK", "1"}}), "RANK is set but WORLD_SIZE is not"));
  EXPECT_TRUE(Contains(DetectError({{"OMPI_COMM_WORLD_SIZE", "4"}}), "OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK"));
  EXPECT_TRUE(Contains(DetectError({{"RANK", "x"}, {"WORLD_SIZE", "4"}}), "RANK='x' is not an integer"));
  EXPECT_TRUE(Contains(DetectError({{"RANK", "1"}, {"WORLD_SIZE", "0"}}), "WORLD_SIZE='0'"));
  EXPECT_TRUE(Contains(DetectError({{"RANK", "-1"}, {"WORLD_SIZE", "4"}}), "RANK='-1'"));
  EXPECT_TRUE(Contains(DetectError({{"RANK", "4"}, {"WORLD_SIZE", "4"}}), "RANK=4 is not below WORLD_SIZE=4"));
  EXPECT_TRUE(Contains(DetectError({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}}),
                       "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"));
  EXPECT_TRUE(Contains(DetectError({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "8"}}),
                       "LOCAL_WORLD_SIZE=8 exceeds WORLD_SIZE=4"));
  EXPECT_TRUE(Contains(DetectError({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "5"}}),
                       "SLURM_LOCALID=5 is not below SLURM_NTASKS=2"));
}

TEST(DetectLaunch, LaunchersThatAgreeAreFine) {
  LaunchInfo i = MustDetect({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "1"},
                             {"OMPI_COMM_WORLD_SIZE", "2"}, {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}});
  EXPECT_EQ(i.launcher, Launcher::kTorchrun);
  EXPECT_TRUE(i.notes.empty());
}

TEST(DetectLaunch, ConflictingLaunchersAreAnError) {
  std::string e = DetectError({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"OMPI_COMM_WORLD_RANK", "1"},
                               {"OMPI_COMM_WORLD_SIZE", "8"}});
  EXPECT_TRUE(Contains(e, "conflicting launcher variables")) << e;
  EXPECT_TRUE(Contains(e, "RANK=3")) << e;
  EXPECT_TRUE(Contains(e, "OMPI_COMM_WORLD_RANK=1")) << e;
  e = DetectError({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"PMI_RANK", "0"}, {"PMI_SIZE", "6"}});
  EXPECT_TRUE(Contains(e, "PMI_SIZE=6")) << e;
}

TEST(DetectLaunch, OuterLaunchersAreIgnoredWithANote) {
  // srun started one torchrun per node: Slurm's view is per node.
  LaunchInfo a = MustDetect({{"RANK", "6"}, {"WORLD_SIZE", "8"}, {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}});
  EXPECT_EQ(a.launcher, Launcher::kTorchrun);
  EXPECT_EQ(a.rank, 6);
  ASSERT_EQ(a.notes.size(), 1u);
  EXPECT_TRUE(Contains(a.notes[0], "SLURM_PROCID=1")) << a.notes[0];
  // mpirun inside a batch script: every rank inherits the script's SLURM_PROCID=0.
  LaunchInfo b = MustDetect({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "8"}, {"SLURM_PROCID", "0"},
                             {"SLURM_NTASKS", "8"}});
  EXPECT_EQ(b.launcher, Launcher::kOpenMpi);
  EXPECT_EQ(b.rank, 3);
  EXPECT_EQ(b.notes.size(), 1u);
  // mpirun -np 2 torchrun --nproc-per-node 4.
  LaunchInfo c = MustDetect({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  EXPECT_EQ(c.launcher, Launcher::kTorchrun);
  EXPECT_EQ(c.rank, 5);
  ASSERT_EQ(c.notes.size(), 1u);
  EXPECT_TRUE(Contains(c.notes[0], "outer launcher")) << c.notes[0];
}

TEST(ConfiguredRoot, Order) {
  Config kizuna_root;
  kizuna_root.root = "[fd00::2]:4000";
  auto a = ConfiguredRoot(kizuna_root, {{"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"}});
  ASSERT_TRUE(a.ok() && a->has_value());
  EXPECT_EQ((*a)->address, (HostPort{"fd00::2", 4000}));
  EXPECT_EQ((*a)->origin, "KIZUNA_ROOT");

  auto b = ConfiguredRoot(Config(), {{"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"}});
  ASSERT_TRUE(b.ok() && b->has_value());
  EXPECT_EQ((*b)->address, (HostPort{"node0", 29501})) << "never MASTER_PORT itself: torchrun's store is there";

  auto c = ConfiguredRoot(Config(), {{"MASTER_ADDR", "[::1]"}, {"MASTER_PORT", "100"}});
  ASSERT_TRUE(c.ok() && c->has_value());
  EXPECT_EQ((*c)->address, (HostPort{"::1", 101}));

  auto none = ConfiguredRoot(Config(), {});
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
}

TEST(ConfiguredRoot, Errors) {
  Config bad;
  bad.root = "node0";
  auto a = ConfiguredRoot(bad, {});
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(a.status().message(), "KIZUNA_ROOT")) << a.status().message();
  EXPECT_TRUE(Contains(ConfiguredRoot(Config(), {{"MASTER_ADDR", "n"}}).status().message(), "MASTER_PORT is not"));
  EXPECT_TRUE(Contains(ConfiguredRoot(Config(), {{"MASTER_ADDR", "n"}, {"MASTER_PORT", "65535"}}).status().message(),
                       "MASTER_PORT='65535'"));
  EXPECT_TRUE(Contains(ConfiguredRoot(Config(), {{"MASTER_ADDR", "a b"}, {"MASTER_PORT", "5"}}).status().message(),
                       "MASTER_ADDR"));
}

std::string TempPath(const std::string& name) {
  const char* dir = getenv("TEST_TMPDIR");
  std::string path = fmt::format("{}/{}.{}", dir ? dir : "/tmp", name, getpid());
  std::remove(path.c_str());
  return path;
}

TEST(ObtainUniqueId, FromTheVariable) {
  Config c;
  c.unique_id = "kz1:127.0.0.1:29501:0123456789abcdef0123456789abcdef";
  LaunchInfo launch = MustDetect({{"RANK", "1"}, {"WORLD_SIZE", "2"}});
  auto id = ObtainUniqueId(launch, c, {}, In(1));
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_EQ(id->source, UniqueIdSource::kVariable);
  EXPECT_EQ(id->id.ToString(), c.unique_id);

  c.unique_id = "kz1:127.0.0.1:29501:0123";
  auto bad = ObtainUniqueId(launch, c, {}, In(1));
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(bad.status().message(), "KIZUNA_UNIQUE_ID")) << bad.status().message();
}

TEST(ObtainUniqueId, FileWrittenByRankZeroAndAwaitedByTheOthers) {
  Config c;
  c.unique_id_file = TempPath("kz_unique_id");
  const uint16_t port = testing::FreePort();
  ASSERT_NE(port, 0);
  // Ranks 1 and 2 start first and wait; rank 0 comes 300 ms later.
  std::vector<Result<ObtainedUniqueId>> got(3, Result<ObtainedUniqueId>(Internal("not run")));
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      LaunchInfo launch = MustDetect({{"RANK", std::to_string(r)}, {"WORLD_SIZE", "3"}});
      Config mine = c;
      if (r == 0) mine.root = fmt::format("127.0.0.1:{}", port);  // KIZUNA_ROOT
      got[r] = ObtainUniqueId(launch, mine, {}, In(10));
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(got[r].ok()) << "rank " << r << ": " << got[r].status().ToString();
  EXPECT_EQ(got[0]->source, UniqueIdSource::kFile);
  EXPECT_EQ(got[1]->id, got[0]->id);
  EXPECT_EQ(got[2]->id, got[0]->id);
  EXPECT_EQ(got[0]->id.root, (HostPort{"127.0.0.1", port}));
  struct stat st;
  ASSERT_EQ(stat(c.unique_id_file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "the id file holds the secret: owner-only";
  EXPECT_NE(stat((c.unique_id_file + ".tmp." + std::to_string(getpid())).c_str(), &st), 0) << "temporary file left";
  internal::TakeReservedListener(got[0]->id.root.port).Reset();
}

TEST(ObtainUniqueId, FileThatNeverAppearsTimesOut) {
  Config c;
  c.unique_id_file = TempPath("kz_never");
  LaunchInfo launch = MustDetect({{"RANK", "1"}, {"WORLD_SIZE", "2"}});
  auto start = std::chrono::steady_clock::now();
  auto r = ObtainUniqueId(launch, c, {}, In(0.3));
  EXPECT_EQ(r.status().code(), StatusCode::kTimeout);
  EXPECT_TRUE(Contains(r.status().message(), c.unique_id_file)) << r.status().message();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 2.0);
}

TEST(ObtainUniqueId, MalformedFileIsAnError) {
  Config c;
  c.unique_id_file = TempPath("kz_bad_id");
  {
    std::ofstream f(c.unique_id_file);
    f << "hello\n";
  }
  LaunchInfo launch = MustDetect({{"RANK", "1"}, {"WORLD_SIZE", "2"}});
  auto r = ObtainUniqueId(launch, c, {}, In(5));
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(r.status().message(), "KIZUNA_UNIQUE_ID_FILE")) << r.status().message();
}

// An id file that is a device or a FIFO: refused promptly, naming the variable — never read
// without end nor waited on for a writer that never comes.
TEST(ObtainUniqueId, EndlessOrWriterlessFilesAreRefusedPromptly) {
  LaunchInfo launch = MustDetect({{"RANK", "1"}, {"WORLD_SIZE", "2"}});
  Config zero;
  zero.unique_id_file = "/dev/zero";
  auto r = ObtainUniqueId(launch, zero, {}, In(5));
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(r.status().message(), "KIZUNA_UNIQUE_ID_FILE")) << r.status().message();
  EXPECT_TRUE(Contains(r.status().message(), "larger than")) << r.status().message();
  Config fifo;
  fifo.unique_id_file = TempPath("kz_fifo");
  ASSERT_EQ(mkfifo(fifo.unique_id_file.c_str(), 0600), 0);
  const auto start = std::chrono::steady_clock::now();
  r = ObtainUniqueId(launch, fifo, {}, In(5));
  EXPECT_FALSE(r.ok());
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 4.0);
  unlink(fifo.unique_id_file.c_str());
}

TEST(ObtainUniqueId, SingleRankNeedsNothing) {
  auto r = ObtainUniqueId(LaunchInfo(), Config(), {}, In(1));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->source, UniqueIdSource::kGenerated);
  internal::TakeReservedListener(r->id.root.port).Reset();
}

TEST(ObtainUniqueId, NoSourceExplainsTheOptions) {
  LaunchInfo launch = MustDetect({{"RANK", "1"}, {"WORLD_SIZE", "4"}});
  auto r = ObtainUniqueId(launch, Config(), {}, In(1));
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  for (const char* option : {"KIZUNA_UNIQUE_ID ", "KIZUNA_UNIQUE_ID_FILE", "GetUniqueId", "kizuna-run", "PMIx"})
    EXPECT_TRUE(Contains(r.status().message(), option)) << option << " missing from: " << r.status().message();
}

}  // namespace
}  // namespace kizuna::bootstrap
