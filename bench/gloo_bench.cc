// gloo_bench: the race's Gloo peer. Times Gloo's collectives through its public C++ API alone (no
// kizuna code), as torch.distributed's Gloo backend calls them: a TCP device on one address, a
// FileStore rendezvous in a directory every rank can read, gloo::allreduce with the ring algorithm.
// The method is the race's (bench/README.md): float32 sum, page-aligned buffers touched before use,
// 5 warm-up calls, iterations = clamp(1 s / estimate, 5, 1000), each timed iteration barrier ->
// collective with the slowest rank's time, the median reported, busbw by nccl-tests' factors, every
// size's result checked once. One process per rank, started by bench/race.sh; threads are not
// pinned (pinning costs Gloo milliseconds per small call here).
//
//   gloo_bench --rank R --size N --store DIR --coll allreduce,allgather --sizes 8,1M [--addr 127.0.0.1]
//
// Rank 0 prints "RESULT lib=gloo coll=... n=... bytes=... iters=... time_us=... busbw=... wrong=..."
// per case. ReduceScatter is Gloo's ReduceScatterHalvingDoubling, which works in place only (the
// line says inplace=1) and leaves each rank's block at the start of its buffer; everything else is
// out of place.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr int kWarmups = 5;
constexpr long kMinIters = 5;
constexpr long kMaxIters = 1000;
constexpr double kTargetSeconds = 1.0;

enum class Coll { kAllReduce, kReduceScatter, kAllGather, kBroadcast };

bool ParseColl(const std::string& s, Coll* out) {
  if (s == "allreduce") *out = Coll::kAllReduce;
  else if (s == "reducescatter") *out = Coll::kReduceScatter;
  else if (s == "allgather") *out = Coll::kAllGather;
  else if (s == "broadcast") *out = Coll::kBroadcast;
  else return false;
  return true;
}

const char* CollName(Coll c) {
  switch (c) {
    case Coll::kAllReduce: return "allreduce";
    case Coll::kReduceScatter: return "reducescatter";
    case Coll::kAllGather: return "allgather";
    case Coll::kBroadcast: return "broadcast";
  }
  return "?";
}

// "64M" -> 67108864 (K, M, G are powers of 1024); 0 when malformed.
size_t ParseSize(const std::string& s) {
  char* end = nullptr;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (end == s.c_str()) return 0;
  if (*end == 'K' || *end == 'k') v <<= 10, ++end;
  else if (*end == 'M' || *end == 'm') v <<= 20, ++end;
  else if (*end == 'G' || *end == 'g') v <<= 30, ++end;
  return *end == '\0' ? v : 0;
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string tok; std::getline(in, tok, ',');)
    if (!tok.empty()) out.push_back(tok);
  return out;
}

double BusFactor(Coll c, int n) {
  if (c == Coll::kAllReduce) return 2.0 * (n - 1) / n;
  if (c == Coll::kBroadcast) return 1.0;
  return static_cast<double>(n - 1) / n;
}

// Page-aligned and touched, so first-touch page faults stay out of the timed calls.
struct Buffer {
  explicit Buffer(size_t bytes) {
    size_t rounded = std::max<size_t>(4096, (bytes + 4095) / 4096 * 4096);
    p = static_cast<float*>(std::aligned_alloc(4096, rounded));
    if (p == nullptr) {
      std::fprintf(stderr, "gloo_bench: cannot allocate %zu bytes\n", rounded);
      std::exit(2);
    }
    std::memset(p, 0, rounded);
  }
  ~Buffer() { std::free(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* p = nullptr;
};

float InputValue(int rank, size_t i) { return static_cast<float>(rank + 1 + static_cast<int>(i % 7)); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t k = v.size();
  return k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
}

using Clock = std::chrono::steady_clock;

class Bench {
 public:
  Bench(std::shared_ptr<gloo::Context> ctx, int rank, int n) : ctx_(std::move(ctx)), rank_(rank), n_(n) {}

  void Run(Coll coll, size_t requested) {
    coll_ = coll;
    count_ = requested / sizeof(float);
    if (coll == Coll::kReduceScatter || coll == Coll::kAllGather) count_ = count_ / n_ * n_;
    if (count_ == 0) count_ = (coll == Coll::kReduceScatter || coll == Coll::kAllGather) ? n_ : 1;
    const size_t bytes = count_ * sizeof(float);
    const size_t in_count = coll == Coll::kAllGather ? count_ / n_ : count_;
    // Gloo's reduce-scatter works in place on the full vector; its result is this rank's block.
    const size_t out_count = coll == Coll::kReduceScatter ? 0 : count_;
    Buffer in(in_count * sizeof(float));
    Buffer out(out_count * sizeof(float));
    in_ = in.p;
    out_ = out.p;
    Fill(in_count);
    Prepare();

    std::vector<double> warm;
    for (int w = 0; w < kWarmups; ++w) warm.push_back(SlowestOf({TimeOne()})[0]);
    const double estimate = Median(warm);
    long iters = estimate > 0 ? static_cast<long>(kTargetSeconds / estimate) : kMaxIters;
    iters = std::clamp(iters, kMinIters, kMaxIters);
    std::vector<double> mine;
    mine.reserve(iters);
    for (long it = 0; it < iters; ++it) {
      if (coll == Coll::kReduceScatter) Zero(in_count);  // keeps the in-place values finite
      mine.push_back(TimeOne());
    }
    const double t = Median(SlowestOf(mine));

    Fill(in_count);
    Prepare();
    const long long wrong = static_cast<long long>(SumOf(static_cast<double>(Check())));
    if (rank_ == 0) {
      std::printf("RESULT lib=gloo coll=%s n=%d bytes=%zu iters=%ld time_us=%.2f busbw=%.4f wrong=%lld%s\n",
                  CollName(coll), n_, bytes, iters, t * 1e6, bytes / t / 1e9 * BusFactor(coll, n_), wrong,
                  coll == Coll::kReduceScatter ? " inplace=1" : "");
      std::fflush(stdout);
    }
    allreduce_.reset();
    allgather_.reset();
    broadcast_.reset();
    reduce_scatter_.reset();
  }

 private:
  void Fill(size_t in_count) {
    for (size_t i = 0; i < in_count; ++i) in_[i] = InputValue(rank_, i);
  }
  void Zero(size_t in_count) { std::memset(in_, 0, in_count * sizeof(float)); }

  // The options objects are built once per size and reused, as a framework that caches them would.
  void Prepare() {
    switch (coll_) {
      case Coll::kAllReduce:
        allreduce_ = std::make_unique<gloo::AllreduceOptions>(ctx_);
        allreduce_->setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
        allreduce_->setInput(in_, count_);
        allreduce_->setOutput(out_, count_);
        allreduce_->setReduceFunction(
            static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
        break;
      case Coll::kAllGather:
        allgather_ = std::make_unique<gloo::AllgatherOptions>(ctx_);
        allgather_->setInput(in_, count_ / n_);
        allgather_->setOutput(out_, count_);
        break;
      case Coll::kBroadcast:
        broadcast_ = std::make_unique<gloo::BroadcastOptions>(ctx_);
        if (rank_ == 0) broadcast_->setInput(in_, count_);
        broadcast_->setOutput(out_, count_);
        broadcast_->setRoot(0);
        break;
      case Coll::kReduceScatter: {
        std::vector<int> recv(n_, static_cast<int>(count_ / n_));
        reduce_scatter_ = std::make_unique<gloo::ReduceScatterHalvingDoubling<float>>(
            ctx_, std::vector<float*>{in_}, static_cast<int>(count_), recv);
        break;
      }
    }
  }

  void RunOnce() {
    switch (coll_) {
      case Coll::kAllReduce: gloo::allreduce(*allreduce_); break;
      case Coll::kAllGather: gloo::allgather(*allgather_); break;
      case Coll::kBroadcast: gloo::broadcast(*broadcast_); break;
      case Coll::kReduceScatter: reduce_scatter_->run(); break;
    }
  }

  double TimeOne() {
    gloo::BarrierOptions barrier(ctx_);
    gloo::barrier(barrier);
    auto t0 = Clock::now();
    RunOnce();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }

  // Element-wise maximum over the ranks: each iteration's slowest rank.
  std::vector<double> SlowestOf(std::vector<double> v) {
    std::vector<double> out(v.size());
    gloo::AllreduceOptions opts(ctx_);
    opts.setInput(v.data(), v.size());
    opts.setOutput(out.data(), out.size());
    opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::max<double>));
    opts.setTag(1);
    gloo::allreduce(opts);
    return out;
  }

  double SumOf(double x) {
    double out = 0;
    gloo::AllreduceOptions opts(ctx_);
    opts.setInput(&x, 1);
    opts.setOutput(&out, 1);
    opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<double>));
    opts.setTag(2);
    gloo::allreduce(opts);
    return out;
  }

  long long Check() {
    const size_t block = count_ / n_;
    const float rank_sum = static_cast<float>(n_) * (n_ + 1) / 2;
    const float nan = std::strtof("nan", nullptr);
    // ReduceScatterHalvingDoubling leaves this rank's block at the start of the buffer.
    float* result = coll_ == Coll::kReduceScatter ? in_ : out_;
    const size_t result_count = coll_ == Coll::kReduceScatter ? block : count_;
    if (coll_ != Coll::kReduceScatter) std::fill(out_, out_ + count_, nan);
    RunOnce();
    long long wrong = 0;
    for (size_t i = 0; i < result_count; ++i) {
      float want = 0;
      switch (coll_) {
        case Coll::kAllReduce: want = rank_sum + n_ * static_cast<float>(i % 7); break;
        case Coll::kReduceScatter: want = rank_sum + n_ * static_cast<float>((rank_ * block + i) % 7); break;
        case Coll::kAllGather: want = InputValue(static_cast<int>(i / block), i % block); break;
        case Coll::kBroadcast: want = InputValue(0, i); break;
      }
      if (result[i] != want) ++wrong;
    }
    return wrong;
  }

  std::shared_ptr<gloo::Context> ctx_;
  int rank_, n_;
  Coll coll_ = Coll::kAllReduce;
  size_t count_ = 0;
  float* in_ = nullptr;
  float* out_ = nullptr;
  std::unique_ptr<gloo::AllreduceOptions> allreduce_;
  std::unique_ptr<gloo::AllgatherOptions> allgather_;
  std::unique_ptr<gloo::BroadcastOptions> broadcast_;
  std::unique_ptr<gloo::ReduceScatterHalvingDoubling<float>> reduce_scatter_;
};

void Usage() {
  std::fprintf(stderr,
               "usage: gloo_bench --rank R --size N --store DIR --coll allreduce|reducescatter|allgather|broadcast[,...] "
               "--sizes 8,1M,64M [--addr 127.0.0.1] [--prefix TEXT]\n");
}

}  // namespace

int main(int argc, char** argv) {
  int rank = -1, size = -1;
  std::string store_dir, addr = "127.0.0.1", prefix = "gloo-bench";
  std::vector<Coll> colls;
  std::vector<size_t> sizes;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "gloo_bench: %s needs a value\n", a.c_str());
      Usage();
      return 2;
    }
    std::string v = argv[++i];
    if (a == "--rank") rank = std::atoi(v.c_str());
    else if (a == "--size") size = std::atoi(v.c_str());
    else if (a == "--store") store_dir = v;
    else if (a == "--addr") addr = v;
    else if (a == "--prefix") prefix = v;
    else if (a == "--coll") {
      for (const auto& tok : Split(v)) {
        Coll c;
        if (!ParseColl(tok, &c)) {
          std::fprintf(stderr, "gloo_bench: --coll: unknown collective '%s'\n", tok.c_str());
          return 2;
        }
        colls.push_back(c);
      }
    } else if (a == "--sizes") {
      for (const auto& tok : Split(v)) {
        size_t s = ParseSize(tok);
        if (s == 0) {
          std::fprintf(stderr, "gloo_bench: --sizes: malformed size '%s' (e.g. 8, 1M, 64M)\n", tok.c_str());
          return 2;
        }
        sizes.push_back(s);
      }
    } else {
      std::fprintf(stderr, "gloo_bench: unknown argument '%s'\n", a.c_str());
      Usage();
      return 2;
    }
  }
  if (size < 1 || rank < 0 || rank >= size || store_dir.empty() || colls.empty() || sizes.empty()) {
    std::fprintf(stderr, "gloo_bench: need --rank in [0, size), --size >= 1, --store, --coll and --sizes\n");
    Usage();
    return 2;
  }

  gloo::transport::tcp::attr attr;
  attr.hostname = addr;
  auto device = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore file_store(store_dir);
  gloo::rendezvous::PrefixStore store(prefix, file_store);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  // 256 MiB over 8 oversubscribed ranks takes about a second per call; Gloo's default of 30 s
  // leaves room, but a loaded machine should not turn into a spurious timeout.
  context->setTimeout(std::chrono::seconds(300));
  context->connectFullMesh(store, device);

  Bench bench(context, rank, size);
  for (Coll c : colls)
    for (size_t s : sizes) bench.Run(c, s);
  return 0;
}
