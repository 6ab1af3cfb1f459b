// The byte encoding of the TCP bootstrap's messages and the frames on authenticated connections.
#include <chrono>
#include <string>

#include <fmt/format.h>

#include "runtime/bootstrap/tcp_internal.h"

namespace kizuna::bootstrap::tcp {

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void PutU16(Bytes& b, uint16_t v) {
  b.push_back(static_cast<uint8_t>(v));
  b.push_back(static_cast<uint8_t>(v >> 8));
}
void PutU32(Bytes& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void PutU64(Bytes& b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void PutString(Bytes& b, std::string_view s) {
  PutU16(b, static_cast<uint16_t>(s.size()));
  b.insert(b.end(), s.begin(), s.end());
}

uint64_t WireReader::Uint(int bytes) {
  if (!ok_ || pos_ + bytes > b_.size()) {
    ok_ = false;
    return 0;
  }
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{b_[pos_ + i]} << (8 * i);
  pos_ += bytes;
  return v;
}

std::string WireReader::String(size_t max) {
  size_t n = Uint(2);
  if (!ok_ || n > max || pos_ + n > b_.size()) {
    ok_ = false;
    return {};
  }
  std::string s(reinterpret_cast<const char*>(b_.data() + pos_), n);
  pos_ += n;
  return s;
}

std::span<const uint8_t> WireReader::Take(size_t n) {
  if (!ok_ || pos_ + n > b_.size()) {
    ok_ = false;
    return {};
  }
  auto s = b_.subspan(pos_, n);
  pos_ += n;
  return s;
}

std::string_view KindName(uint32_t kind) { return kind == kKindBarrier ? "Barrier" : "AllGather"; }

size_t MaxPayload(FrameType type, int size) {
  switch (type) {
    case FrameType::kJoin:
    case FrameType::kPeerHello: return kMaxIntroBytes;
    case FrameType::kWelcome: return 16 + static_cast<size_t>(size) * (4 + kMaxHostBytes);
    case FrameType::kAbort: return kMaxAbortBytes;
    case FrameType::kGather:
    case FrameType::kData: return kMaxMessageBytes;
    case FrameType::kGatherResult: return kMaxAllGatherBytes + 8 + 8 * static_cast<size_t>(size);
  }
  return 0;
}

Bytes FrameHeader(FrameType type, uint32_t tag, uint64_t length) {
  Bytes h;
  h.reserve(kFrameHeaderBytes);
  PutU32(h, kFrameMagic);
  PutU32(h, static_cast<uint32_t>(type));
  PutU32(h, tag);
  PutU32(h, 0);
  PutU64(h, length);
  return h;
}

std::string RankList(const std::vector<int>& ranks) {
  std::string s;
  const size_t kShown = 16;
  for (size_t i = 0; i < ranks.size() && i < kShown; ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > kShown) s += fmt::format(" and {} more", ranks.size() - kShown);
  return s;
}

std::string PluralRanks(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", RankList(ranks));
}

}  // namespace kizuna::bootstrap::tcp
