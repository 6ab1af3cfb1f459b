#include "runtime/bootstrap/in_process.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>

#include <fmt/format.h>

namespace kizuna::bootstrap {
namespace {

using Clock = Deadline::Clock;

constexpr uint32_t kKindAllGather = 0;
constexpr uint32_t kKindBarrier = 1;
std::string_view KindName(uint32_t kind) { return kind == kKindBarrier ? "Barrier" : "AllGather"; }

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string RankList(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size() && i < 16; ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > 16) s += fmt::format(" and {} more", ranks.size() - 16);
  return s;
}

// Shared by the n Bootstraps of one CreateInProcessBootstraps call.
struct Store {
  explicit Store(int n) : size(n), left(n, false) {}

  struct Round {
    std::vector<std::optional<Bytes>> parts;
    std::vector<uint32_t> kinds;
    int fetched = 0;
  };

  const int size;
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, Round> rounds;                                   // guarded by mu
  std::map<std::tuple<int, int, uint32_t>, std::deque<Bytes>> mail;  // (from, to, tag); guarded by mu
  std::vector<bool> left;                                             // guarded by mu
};

class InProcessBootstrap final : public Bootstrap {
 public:
  InProcessBootstrap(std::shared_ptr<Store> store, int rank) : Bootstrap(rank, store->size), store_(std::move(store)) {}

  ~InProcessBootstrap() override {
    {
      std::lock_guard<std::mutex> lock(store_->mu);
      store_->left[rank()] = true;
    }
    store_->cv.notify_all();
  }

  std::string_view kind() const override { return "in-process"; }

 protected:
  Result<std::vector<Bytes>> DoAllGather(std::span<const uint8_t> mine, Deadline deadline) override {
    return Collective(kKindAllGather, mine, deadline);
  }
  Status DoBarrier(Deadline deadline) override { return Collective(kKindBarrier, {}, deadline).status(); }

  Status DoSend(int peer, uint32_t tag, std::span<const uint8_t> bytes, Deadline) override {
    {
      std::lock_guard<std::mutex> lock(store_->mu);
      if (store_->left[peer])
        return RemoteError(fmt::format("Send to rank {} (tag {}): rank {} has left (its Bootstrap was destroyed)",
                                       peer, tag, peer));
      store_->mail[{rank(), peer, tag}].emplace_back(bytes.begin(), bytes.end());
    }
    store_->cv.notify_all();
    return Status::Ok();
  }

  Result<Bytes> DoRecv(int peer, uint32_t tag, Deadline deadline) override {
    Clock::time_point start = Clock::now();
    std::unique_lock<std::mutex> lock(store_->mu);
    auto key = std::make_tuple(peer, rank(), tag);
    auto ready = [&] {
      auto it = store_->mail.find(key);
      return (it != store_->mail.end() && !it->second.empty()) || store_->left[peer];
    };
    if (peer == rank() && !ready())
      return InvalidArgument(fmt::format("Recv from this rank itself (rank {}, tag {}) with no message waiting: send "
                                         "it first",
                                         peer, tag));
    if (!store_->cv.wait_until(lock, deadline.when(), ready))
      return Timeout(fmt::format("Recv from rank {} (tag {}): nothing arrived within {:.1f} s", peer, tag,
                                 SecondsSince(start)));
    auto it = store_->mail.find(key);
    if (it == store_->mail.end() || it->second.empty())
      return RemoteError(fmt::format("Recv from rank {} (tag {}): rank {} left (its Bootstrap was destroyed) before "
                                     "sending",
                                     peer, tag, peer));
    Bytes b = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) store_->mail.erase(it);
    return b;
  }

 private:
  Result<std::vector<Bytes>> Collective(uint32_t kind, std::span<const uint8_t> mine, Deadline deadline) {
    std::string_view op = KindName(kind);
    Clock::time_point start = Clock::now();
    const int n = size();
    std::unique_lock<std::mutex> lock(store_->mu);
    const uint64_t number = round_++;
    Store::Round& round = store_->rounds[number];
    if (round.parts.empty()) {
      round.parts.resize(n);
      round.kinds.assign(n, kind);
    }
    round.parts[rank()] = Bytes(mine.begin(), mine.end());
    round.kinds[rank()] = kind;
    store_->cv.notify_all();
    auto gone = [&] {
      std::vector<int> g;
      for (int r = 0; r < n; ++r)
        if (!round.parts[r] && store_->left[r]) g.push_back(r);
      return g;
    };
    auto complete = [&] {
      for (int r = 0; r < n; ++r)
        if (!round.parts[r] && !store_->left[r]) return false;
      return true;
    };
    if (!store_->cv.wait_until(lock, deadline.when(), complete)) {
      std::vector<int> missing;
      for (int r = 0; r < n; ++r)
        if (!round.parts[r]) missing.push_back(r);
      return Timeout(fmt::format("{} #{}: {} did not call {} within {:.1f} s", op, number, RankList(missing), op,
                                 SecondsSince(start)));
    }
    if (std::vector<int> g = gone(); !g.empty())
      return RemoteError(fmt::format("{} #{}: {} left (Bootstrap destroyed) before taking part", op, number,
                                     RankList(g)));
    for (int r = 0; r < n; ++r) {
      if (round.kinds[r] != kind)
        return InvalidArgument(fmt::format("collective mismatch: rank {} called {} while rank {} called {}", rank(), op,
                                           r, KindName(round.kinds[r])));
    }
    std::vector<Bytes> out;
    if (kind == kKindAllGather) {
      size_t total = 0;
      for (int r = 0; r < n; ++r) total += round.parts[r]->size();
      if (total > kMaxAllGatherBytes)
        return InvalidArgument(fmt::format("AllGather: {} bytes in all exceed the limit of {} bytes", total,
                                           kMaxAllGatherBytes));
      out.reserve(n);
      for (int r = 0; r < n; ++r) out.push_back(*round.parts[r]);
    }
    if (++round.fetched == n) store_->rounds.erase(number);
    return out;
  }

  std::shared_ptr<Store> store_;
  uint64_t round_ = 0;  // this rank's next collective
};

}  // namespace

Result<std::vector<std::unique_ptr<Bootstrap>>> CreateInProcessBootstraps(int n) {
  if (n < 1 || n > kMaxRanks)
    return InvalidArgument(fmt::format("in-process bootstrap: {} ranks is not in 1..{}", n, kMaxRanks));
  auto store = std::make_shared<Store>(n);
  std::vector<std::unique_ptr<Bootstrap>> out;
  out.reserve(n);
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<InProcessBootstrap>(store, r));
  return out;
}

}  // namespace kizuna::bootstrap
