// JSON from files that users and other programs write (topology files, INA layouts): parsed with a
// nesting limit, with errors that name the line and column.
//
// nlohmann's parser itself is iterative, but printing, comparing or copying a value recurses once
// per level, so a file of 75,000 nested brackets (200 KB) overflows a thread's stack in whatever
// error message prints it. ParseJson refuses such text before it builds any tree, and JsonExcerpt
// prints a bounded excerpt of a value without recursing deeper than a few levels.
//
// A library of its own (//runtime/core:json), so that the ground (//runtime/core) stays free of
// nlohmann.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/core/status.h"

namespace kizuna {

// Deeper than any format kizuna reads (a topology file is 3 levels, an INA layout 5).
inline constexpr int kMaxJsonDepth = 64;

// Parses `text`; `source` names it in errors, which are kInvalidArgument:
//   "t.json:3:19: invalid JSON: syntax error while parsing object - unexpected string literal; ..."
//   "t.json:1:65: nesting deeper than 64 levels"
// The position is the offending token's (1-based line and column, in bytes).
Result<nlohmann::json> ParseJson(std::string_view text, std::string_view source, int max_depth = kMaxJsonDepth);

// A value as compact JSON for an error message, at most `max_chars` bytes (cut with "..."), values
// nested deeper than a few levels shown as [...] and {...}; invalid UTF-8 replaced. Small values
// print exactly as value.dump() does.
std::string JsonExcerpt(const nlohmann::json& value, size_t max_chars = 120);

struct LineColumn {
  int line = 1;
  int column = 1;
};

// Lines of a text, indexed once, so that naming the line of each of a file's many entries costs a
// binary search each instead of a scan from the start.
class LineIndex {
 public:
  explicit LineIndex(std::string_view text);
  // The 1-based line and column of byte `offset` (clamped to the text's end).
  LineColumn At(size_t offset) const;
  int LineAt(size_t offset) const { return At(offset).line; }

 private:
  size_t size_ = 0;
  std::vector<size_t> starts_;  // offset of each line's first byte
};

}  // namespace kizuna
