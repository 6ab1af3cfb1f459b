// One byte encoding for the messages ranks exchange (bootstrap frames, connection records, the
// rows that describe a communicator's shape): little-endian integers, doubles as their IEEE-754
// bits, strings and byte runs behind a 32-bit length. Put* append to a byte vector; a Reader
// takes them back in the same order. Every read is bounds-checked: a short or malformed message
// turns ok() false (it stays false) and the failed read and every later one return zero or empty,
// so a parser reads a whole record and checks ok() (or AtEnd()) once.
#pragma once

#include <bit>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kizuna::wire {

using Bytes = std::vector<uint8_t>;

inline void PutUint(Bytes& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
inline void PutU8(Bytes& out, uint8_t v) { out.push_back(v); }
inline void PutU16(Bytes& out, uint16_t v) { PutUint(out, v, 2); }
inline void PutU32(Bytes& out, uint32_t v) { PutUint(out, v, 4); }
inline void PutU64(Bytes& out, uint64_t v) { PutUint(out, v, 8); }
inline void PutI32(Bytes& out, int32_t v) { PutU32(out, static_cast<uint32_t>(v)); }
inline void PutF64(Bytes& out, double v) { PutU64(out, std::bit_cast<uint64_t>(v)); }
inline void PutBytes(Bytes& out, std::span<const uint8_t> bytes) {
  PutU32(out, static_cast<uint32_t>(bytes.size()));
  out.insert(out.end(), bytes.begin(), bytes.end());
}
inline void PutString(Bytes& out, std::string_view s) {
  PutBytes(out, std::span(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
}

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> in) : in_(in) {}

  uint64_t Uint(int bytes) {
    const auto n = static_cast<size_t>(bytes);
    if (!ok_ || n > in_.size() - pos_) {
      ok_ = false;
      return 0;
    }
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= uint64_t{in_[pos_ + i]} << (8 * i);
    pos_ += n;
    return v;
  }
  uint8_t U8() { return static_cast<uint8_t>(Uint(1)); }
  uint16_t U16() { return static_cast<uint16_t>(Uint(2)); }
  uint32_t U32() { return static_cast<uint32_t>(Uint(4)); }
  uint64_t U64() { return Uint(8); }
  int32_t I32() { return static_cast<int32_t>(U32()); }
  double F64() { return std::bit_cast<double>(U64()); }
  // A run that PutBytes wrote, of at most `max` bytes (longer: malformed). Points into the input.
  std::span<const uint8_t> Bytes(size_t max = SIZE_MAX) {
    const size_t n = U32();
    if (n > max) ok_ = false;
    return Take(n);
  }
  std::string String(size_t max = SIZE_MAX) {
    const std::span<const uint8_t> b = Bytes(max);
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  }
  // The next `n` raw bytes (no length before them).
  std::span<const uint8_t> Take(size_t n) {
    if (!ok_ || n > in_.size() - pos_) {
      ok_ = false;
      return {};
    }
    const std::span<const uint8_t> s = in_.subspan(pos_, n);
    pos_ += n;
    return s;
  }

  bool ok() const { return ok_; }
  // Every byte was read, and every read succeeded.
  bool AtEnd() const { return ok_ && pos_ == in_.size(); }
  size_t left() const { return in_.size() - pos_; }

 private:
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace kizuna::wire
