// The launcher stores: the PMI-1 client against a fake PMI server on a socket pair (the commands
// it sends, the answers it takes, a server that closes or never answers), and which store an
// environment names.
#include "runtime/bootstrap/launcher_kvs.h"

#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace kizuna::bootstrap {
namespace {

// A PMI-1 server for one client: answers as MPICH's Hydra does, records the commands.
class FakePmi {
 public:
  enum class Mode { kAnswer, kCloseAfterInit, kSilentAtBarrier };
  explicit FakePmi(Mode mode, std::map<std::string, std::string> kvs = {}) : mode_(mode), kvs_(std::move(kvs)) {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    client_ = fds[0];
    server_ = fds[1];
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakePmi() {
    ::shutdown(client_, SHUT_RDWR);
    thread_.join();
    ::close(client_);
    ::close(server_);
  }
  int client() const { return client_; }
  const std::vector<std::string>& commands() const { return commands_; }
  std::map<std::string, std::string>& kvs() { return kvs_; }

 private:
  void Serve() {
    std::string line;
    char c;
    while (::read(server_, &c, 1) == 1) {
      if (c != '\n') {
        line.push_back(c);
        continue;
      }
      commands_.push_back(line);
      const std::string cmd = line.substr(0, line.find(' '));
      std::string answer;
      if (cmd == "cmd=init") {
        if (mode_ == Mode::kCloseAfterInit) {
          ::shutdown(server_, SHUT_RDWR);
          return;
        }
        answer = "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0";
      } else if (cmd == "cmd=get_my_kvsname") {
        answer = "cmd=my_kvsname kvsname=kvs_42_0";
      } else if (cmd == "cmd=put") {
        const size_t k = line.find("key="), v = line.find(" value=");
        kvs_[line.substr(k + 4, v - k - 4)] = line.substr(v + 7);
        answer = "cmd=put_result rc=0 msg=success";
      } else if (cmd == "cmd=barrier_in") {
        if (mode_ == Mode::kSilentAtBarrier) {
          line.clear();
          continue;
        }
        answer = "cmd=barrier_out";
      } else if (cmd == "cmd=get") {
        const std::string key = line.substr(line.find("key=") + 4);
        answer = kvs_.count(key) ? "cmd=get_result rc=0 msg=success value=" + kvs_[key]
                                 : "cmd=get_result rc=-1 msg=key_not_found";
      } else if (cmd == "cmd=finalize") {
        answer = "cmd=finalize_ack";
      }
      answer += "\n";
      if (::write(server_, answer.data(), answer.size()) != static_cast<ssize_t>(answer.size())) return;
      line.clear();
    }
  }

  Mode mode_;
  std::map<std::string, std::string> kvs_;
  int client_ = -1, server_ = -1;
  std::vector<std::string> commands_;
  std::thread thread_;
};

TEST(Pmi1, RankZeroPutsAndMeetsTheOthers) {
  FakePmi server(FakePmi::Mode::kAnswer);
  auto kvs = Pmi1OverFd(server.client());
  Result<std::string> got = kvs->Share(0, "kizuna_unique_id", "kizuna1:10.0.0.1:29500:abcd", Deadline::AfterSeconds(5));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "kizuna1:10.0.0.1:29500:abcd");
  EXPECT_EQ(server.kvs()["kizuna_unique_id"], "kizuna1:10.0.0.1:29500:abcd");
}

TEST(Pmi1, OtherRanksGetRankZerosValueAfterTheBarrier) {
  FakePmi server(FakePmi::Mode::kAnswer, {{"kizuna_unique_id", "the-id"}});
  auto kvs = Pmi1OverFd(server.client());
  Result<std::string> got = kvs->Share(2, "kizuna_unique_id", "", Deadline::AfterSeconds(5));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "the-id");
  std::vector<std::string> cmds;
  for (const auto& c : server.commands()) cmds.push_back(c.substr(0, c.find(' ')));
  const std::vector<std::string> want = {"cmd=init", "cmd=get_my_kvsname", "cmd=barrier_in", "cmd=get"};
  EXPECT_EQ(std::vector<std::string>(cmds.begin(), cmds.begin() + 4), want);
}

TEST(Pmi1, AMissingKeyIsAnErrorNamingTheStore) {
  FakePmi server(FakePmi::Mode::kAnswer);
  Result<std::string> got = Pmi1OverFd(server.client())->Share(1, "kizuna_unique_id", "", Deadline::AfterSeconds(5));
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("refused get"), std::string::npos) << got.status().ToString();
  EXPECT_NE(got.status().message().find("PMI-1"), std::string::npos) << got.status().ToString();
}

TEST(Pmi1, AClosedLauncherIsARemoteError) {
  FakePmi server(FakePmi::Mode::kCloseAfterInit);
  Result<std::string> got = Pmi1OverFd(server.client())->Share(1, "k", "", Deadline::AfterSeconds(5));
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kRemoteError) << got.status().ToString();
  EXPECT_NE(got.status().message().find("closed"), std::string::npos) << got.status().ToString();
}

TEST(Pmi1, ABarrierThatNeverEndsTimesOut) {
  FakePmi server(FakePmi::Mode::kSilentAtBarrier);
  Result<std::string> got = Pmi1OverFd(server.client())->Share(1, "k", "", Deadline::AfterSeconds(0.3));
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kTimeout) << got.status().ToString();
  EXPECT_NE(got.status().message().find("barrier_in"), std::string::npos) << got.status().ToString();
}

TEST(LauncherKvs, TheEnvironmentNamesTheStore) {
  auto none = OpenLauncherKvs({{"RANK", "0"}});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
  auto bad = OpenLauncherKvs({{"PMI_FD", "six"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  auto pmi = OpenLauncherKvs({{"PMI_FD", "6"}});
  ASSERT_TRUE(pmi.ok());
  ASSERT_NE(*pmi, nullptr);
  EXPECT_EQ((*pmi)->Describe(), "PMI-1 (PMI_FD 6)");
  // PMIx: the store where libpmix.so.2 loads, else kUnavailable naming the library.
  auto pmix = OpenLauncherKvs({{"PMIX_RANK", "0"}, {"PMIX_NAMESPACE", "job-7"}});
  if (pmix.ok()) {
    ASSERT_NE(*pmix, nullptr);
    EXPECT_EQ((*pmix)->Describe(), "PMIx (namespace job-7)");
  } else {
    EXPECT_EQ(pmix.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(pmix.status().message().find("libpmix.so.2"), std::string::npos);
  }
}

}  // namespace
}  // namespace kizuna::bootstrap
