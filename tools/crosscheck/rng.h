// The cross-check's random source: SplitMix64, and uniform choices written out here rather than
// taken from <random>, whose distributions differ between standard libraries. A case is a pure
// function of (seed, case index), so a reproducer line gives the same case on any build.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

namespace kizuna::crosscheck {

// SplitMix64's finalizer: a bijection of 64-bit words that mixes every input bit into every
// output bit.
inline uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A key for (a, b, c): different triples give unrelated keys.
inline uint64_t Key(uint64_t a, uint64_t b, uint64_t c = 0) { return Mix64(Mix64(Mix64(a) ^ b) ^ c); }

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}

  uint64_t Next() { return Mix64(state_ += 0x9e3779b97f4a7c15ull); }
  // Uniform in [0, n); n >= 1. The modulo bias is below 2^-40 for the small n used here.
  uint64_t Below(uint64_t n) { return n <= 1 ? 0 : Next() % n; }
  // Uniform in [lo, hi].
  int64_t Range(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(Below(static_cast<uint64_t>(hi - lo) + 1)); }
  bool Chance(double p) { return static_cast<double>(Next() >> 11) * 0x1.0p-53 < p; }
  // Log-uniform in [lo, hi], lo >= 1.
  uint64_t LogUniform(uint64_t lo, uint64_t hi) {
    const double a = std::log(static_cast<double>(lo)), b = std::log(static_cast<double>(hi) + 1);
    const double u = static_cast<double>(Next() >> 11) * 0x1.0p-53;
    const auto v = static_cast<uint64_t>(std::exp(a + (b - a) * u));
    return v < lo ? lo : v > hi ? hi : v;
  }
  template <typename T>
  const T& Pick(const std::vector<T>& v) {
    return v[Below(v.size())];
  }
  // A random permutation of 0..n-1.
  std::vector<int> Permutation(int n) {
    std::vector<int> p(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) p[static_cast<size_t>(i)] = i;
    for (int i = n - 1; i > 0; --i) std::swap(p[static_cast<size_t>(i)], p[Below(static_cast<uint64_t>(i) + 1)]);
    return p;
  }

 private:
  uint64_t state_;
};

}  // namespace kizuna::crosscheck
