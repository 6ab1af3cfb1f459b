// The frames on authenticated connections of the TCP bootstrap: their header and their limits.
#include <chrono>
#include <string>

#include <fmt/format.h>

#include "runtime/bootstrap/tcp_internal.h"

namespace kizuna::bootstrap::tcp {

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string_view KindName(uint32_t kind) { return kind == kKindBarrier ? "Barrier" : "AllGather"; }

size_t MaxPayload(FrameType type, int size) {
  switch (type) {
    case FrameType::kJoin:
    case FrameType::kPeerHello: return kMaxIntroBytes;
    // The rank count, then per rank its port (u16) and its host behind a u32 length.
    case FrameType::kWelcome: return 16 + static_cast<size_t>(size) * (2 + 4 + kMaxHostBytes);
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
  wire::PutU32(h, kFrameMagic);
  wire::PutU32(h, static_cast<uint32_t>(type));
  wire::PutU32(h, tag);
  wire::PutU32(h, 0);
  wire::PutU64(h, length);
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
