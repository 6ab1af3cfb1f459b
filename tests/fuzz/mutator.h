// The driver's mutations (driver.cc): a seeded generator that gives the same sequence everywhere,
// the tokens harvested from the corpus, and the mutator that turns seeds into new inputs (byte
// flips, interesting values, tokens, splices, structural edits). Only driver.cc includes it.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace kizuna::fuzz {

using Bytes = std::vector<uint8_t>;

// splitmix64: the same sequence on every platform and library, unlike std's distributions.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t Next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  size_t Below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(Next() % n); }
  bool OneIn(size_t n) { return Below(n) == 0; }

 private:
  uint64_t s_;
};

constexpr uint8_t kInterestingBytes[] = {0,   1,   '\t', '\n', '\r', ' ',  '"',  '\\', ':', ',', '[',
                                         ']', '{', '}',  '-',  '+',  '.',  'e',  '0',  '9', 'w', 'a',
                                         '/', '%', 0x7f, 0x80, 0xc0, 0xe2, 0xed, 0xf0, 0xff};

const char* const kBuiltinTokens[] = {"true",
                                      "false",
                                      "null",
                                      "\"\"",
                                      "[]",
                                      "{}",
                                      "\\u0000",
                                      "\\ud800",
                                      "\\\"",
                                      "0",
                                      "-0",
                                      "-1",
                                      "1",
                                      "63",
                                      "64",
                                      "65",
                                      "255",
                                      "256",
                                      "1023",
                                      "1024",
                                      "1025",
                                      "65535",
                                      "65536",
                                      "65537",
                                      "2147483647",
                                      "2147483648",
                                      "-2147483649",
                                      "4294967296",
                                      "9223372036854775807",
                                      "9223372036854775808",
                                      "-9223372036854775808",
                                      "-9223372036854775809",
                                      "18446744073709551615",
                                      "18446744073709551616",
                                      "1e308",
                                      "1e309",
                                      "-1e309",
                                      "1e-400",
                                      "4.9e-324",
                                      "0.5",
                                      "1.5e2",
                                      "NaN",
                                      "Infinity",
                                      "0x10",
                                      "1K",
                                      "16M",
                                      "2G",
                                      "8T",
                                      "1KiB",
                                      "99999999999999999999T",
                                      " ",
                                      "\t",
                                      ":",
                                      "::",
                                      "[::1]",
                                      "[",
                                      "]",
                                      "127.0.0.1",
                                      "localhost",
                                      "kz1:",
                                      "kz2:",
                                      "^",
                                      ",",
                                      ";",
                                      "ALL",
                                      "^ALL",
                                      "%h",
                                      "%p"};

// Words and short strings of the seeds, to insert elsewhere: key names, node names, kinds.
inline std::vector<std::string> HarvestTokens(const std::vector<Bytes>& corpus) {
  std::set<std::string> tokens(std::begin(kBuiltinTokens), std::end(kBuiltinTokens));
  auto word = [](uint8_t c) { return std::isalnum(c) || c == '_' || c == '-' || c == '.' || c == ':'; };
  for (const Bytes& b : corpus) {
    for (size_t i = 0; i < b.size() && tokens.size() < 2000;) {
      if (b[i] == '"') {
        size_t j = i + 1;
        while (j < b.size() && b[j] != '"' && j - i < 40) j += b[j] == '\\' ? 2 : 1;
        if (j < b.size() && b[j] == '"')
          tokens.emplace(b.begin() + static_cast<ptrdiff_t>(i), b.begin() + static_cast<ptrdiff_t>(j + 1));
        i = j + 1;
      } else if (word(b[i])) {
        size_t j = i;
        while (j < b.size() && word(b[j])) ++j;
        if (j - i >= 2 && j - i <= 40)
          tokens.emplace(b.begin() + static_cast<ptrdiff_t>(i), b.begin() + static_cast<ptrdiff_t>(j));
        i = j;
      } else {
        ++i;
      }
    }
  }
  return {tokens.begin(), tokens.end()};
}

class Mutator {
 public:
  Mutator(const std::vector<Bytes>& corpus, size_t max_len, uint64_t seed)
      : corpus_(corpus), tokens_(HarvestTokens(corpus)), max_len_(max_len), rng_(seed) {}

  Bytes Next() {
    // Mostly a seed with a few mutations; sometimes the last input mutated further (deeper changes).
    Bytes b = !last_.empty() && rng_.OneIn(8) ? last_ : corpus_.empty() ? Bytes() : corpus_[rng_.Below(corpus_.size())];
    // Few mutations per input, and half of the inputs mutated only in ways that keep JSON well
    // formed: most formats here are JSON, which one stray byte already sends to the syntax error.
    const size_t n = rng_.OneIn(2) ? 1 : 1 + rng_.Below(rng_.OneIn(8) ? 16 : 4);
    const bool structural = rng_.OneIn(2);
    for (size_t i = 0; i < n; ++i) Mutate(b, structural);
    if (b.size() > max_len_) b.resize(max_len_);
    last_ = b;
    return b;
  }

 private:
  size_t Pos(const Bytes& b) { return rng_.Below(b.size() + 1); }
  uint8_t InterestingByte() {
    return rng_.OneIn(2) ? kInterestingBytes[rng_.Below(sizeof(kInterestingBytes))] : static_cast<uint8_t>(rng_.Next());
  }
  void Insert(Bytes& b, size_t at, std::string_view s, size_t times = 1) {
    if (b.size() + s.size() * times > max_len_)
      times = s.empty() ? 0 : (max_len_ - std::min(max_len_, b.size())) / s.size();
    Bytes add;
    add.reserve(s.size() * times);
    for (size_t t = 0; t < times; ++t) add.insert(add.end(), s.begin(), s.end());
    b.insert(b.begin() + static_cast<ptrdiff_t>(std::min(at, b.size())), add.begin(), add.end());
  }
  // A run of digits near `at` (or an empty range at `at`).
  std::pair<size_t, size_t> NumberAt(const Bytes& b, size_t at) {
    size_t i = at;
    while (i < b.size() && !std::isdigit(b[i])) ++i;
    if (i == b.size()) return {at, at};
    size_t j = i;
    while (j < b.size() && (std::isdigit(b[j]) || b[j] == '.' || b[j] == 'e' || b[j] == 'E')) ++j;
    if (i > 0 && b[i - 1] == '-') --i;
    return {i, j};
  }

  // The string literal around `at`, or else the string literal, number or word after it:
  // [begin, end), or {at, at} when none. Whether `at` is inside a string is found from the start.
  std::pair<size_t, size_t> TokenAt(const Bytes& b, size_t at) {
    auto word = [](uint8_t c) { return std::isalnum(c) || c == '_' || c == '-' || c == '.' || c == '+'; };
    size_t open = b.size();  // the opening quote of the string `at` is in, if any
    for (size_t i = 0; i < at && i < b.size(); ++i) {
      if (open == b.size()) {
        if (b[i] == '"') open = i;
      } else if (b[i] == '\\') {
        ++i;
      } else if (b[i] == '"') {
        open = b.size();
      }
    }
    size_t i = open < b.size() ? open : at;
    while (i < b.size() && b[i] != '"' && !word(b[i])) ++i;
    if (i >= b.size()) return {at, at};
    size_t j = i + 1;
    if (b[i] == '"') {
      while (j < b.size() && b[j] != '"') j += b[j] == '\\' ? 2 : 1;
      return {i, std::min(j + 1, b.size())};
    }
    while (j < b.size() && word(b[j])) ++j;
    return {i, j};
  }
  // Whether [from, to) is an object's key: a ':' follows it.
  static bool IsKey(const Bytes& b, size_t to) {
    while (to < b.size() && (b[to] == ' ' || b[to] == '\n' || b[to] == '\t' || b[to] == '\r')) ++to;
    return to < b.size() && b[to] == ':';
  }
  // Whether what starts at `from` is an array's element: '[' or ',' before it (a ',' before a '{'
  // or '[' cannot be in an object, whose members start with a key).
  static bool InArray(const Bytes& b, size_t from) {
    while (from > 0 && (b[from - 1] == ' ' || b[from - 1] == '\n' || b[from - 1] == '\t' || b[from - 1] == '\r'))
      --from;
    return from > 0 && (b[from - 1] == '[' || b[from - 1] == ',');
  }

  // The end of the bracketed element that starts at `open` ('[' or '{'), past its closer; 0 if none.
  size_t ElementEnd(const Bytes& b, size_t open) {
    int depth = 0;
    bool in_string = false;
    for (size_t i = open; i < b.size(); ++i) {
      const uint8_t c = b[i];
      if (in_string) {
        if (c == '\\')
          ++i;
        else if (c == '"')
          in_string = false;
      } else if (c == '"') {
        in_string = true;
      } else if (c == '[' || c == '{') {
        ++depth;
      } else if ((c == ']' || c == '}') && --depth == 0) {
        return i + 1;
      }
    }
    return 0;
  }
  // A random '[' or '{' at or after `at` and the end of its element: {0, 0} when none.
  std::pair<size_t, size_t> ElementAt(const Bytes& b, size_t at) {
    size_t i = at;
    while (i < b.size() && b[i] != '[' && b[i] != '{') ++i;
    if (i == b.size()) return {0, 0};
    const size_t end = ElementEnd(b, i);
    return end == 0 ? std::pair<size_t, size_t>{0, 0} : std::pair<size_t, size_t>{i, end};
  }
  // A token as a JSON value: numbers and literals as they are, anything else quoted.
  std::string AsValue(const std::string& token) {
    if (token.empty()) return "\"\"";
    const char c = token[0];
    if (c == '"' || c == '-' || (c >= '0' && c <= '9') || token == "true" || token == "false" || token == "null")
      return token;
    return "\"" + token + "\"";
  }

  void Mutate(Bytes& b, bool structural) {
    // Those that keep JSON well formed: nesting closed again, numbers, values, elements.
    static const int kStructural[] = {8, 9, 15, 16, 17, 18, 19};
    const int kind = structural ? kStructural[rng_.Below(std::size(kStructural))] : static_cast<int>(rng_.Below(20));
    switch (kind) {
      case 0:  // flip a bit
        if (!b.empty()) b[rng_.Below(b.size())] ^= static_cast<uint8_t>(1u << rng_.Below(8));
        break;
      case 1:  // set a byte
        if (!b.empty()) b[rng_.Below(b.size())] = InterestingByte();
        break;
      case 2: {  // insert bytes
        const size_t at = Pos(b), n = 1 + rng_.Below(8);
        for (size_t i = 0; i < n && b.size() < max_len_; ++i)
          b.insert(b.begin() + static_cast<ptrdiff_t>(at), InterestingByte());
        break;
      }
      case 3: {  // erase a range
        if (b.empty()) break;
        const size_t at = rng_.Below(b.size());
        const size_t n = 1 + rng_.Below(std::min<size_t>(b.size() - at, rng_.OneIn(4) ? b.size() : 16));
        b.erase(b.begin() + static_cast<ptrdiff_t>(at), b.begin() + static_cast<ptrdiff_t>(at + n));
        break;
      }
      case 4: {  // copy a range of this input elsewhere
        if (b.empty()) break;
        const size_t from = rng_.Below(b.size());
        const size_t n = 1 + rng_.Below(std::min<size_t>(b.size() - from, 64));
        const std::string chunk(b.begin() + static_cast<ptrdiff_t>(from), b.begin() + static_cast<ptrdiff_t>(from + n));
        Insert(b, Pos(b), chunk);
        break;
      }
      case 5: {  // splice: a range of another seed, inserted or overwriting
        if (corpus_.empty()) break;
        const Bytes& o = corpus_[rng_.Below(corpus_.size())];
        if (o.empty()) break;
        const size_t from = rng_.Below(o.size());
        const size_t n = 1 + rng_.Below(o.size() - from);
        const std::string chunk(o.begin() + static_cast<ptrdiff_t>(from), o.begin() + static_cast<ptrdiff_t>(from + n));
        const size_t at = Pos(b);
        if (rng_.OneIn(2)) b.resize(std::min(b.size(), at));  // this input's head, the other's tail
        Insert(b, at, chunk);
        break;
      }
      case 6:
      case 7:  // a token: a key, a name, a keyword, a boundary number
        Insert(b, Pos(b), tokens_[rng_.Below(tokens_.size())]);
        break;
      case 8: {  // deep nesting: brackets repeated around the limits and far beyond
        static const char* const kOpen[] = {"[", "{\"a\":", "[{\"k\":", "[[", "{\"nodes\":[", "{\"parts\":["};
        static const size_t kDepths[] = {8, 63, 64, 65, 66, 100, 1000, 10000, 75000};
        const std::string_view open = kOpen[rng_.Below(std::size(kOpen))];
        const size_t depth = kDepths[rng_.Below(std::size(kDepths))];
        const size_t at = Pos(b);
        Insert(b, at, open, depth);
        if (structural || rng_.OneIn(2)) {  // closed too, so that the text stays valid where it was
          std::string close;
          for (auto it = open.rbegin(); it != open.rend(); ++it)
            if (*it == '[')
              close += ']';
            else if (*it == '{')
              close += '}';
          Insert(b, std::min(b.size(), at + open.size() * depth), close, depth);
        }
        break;
      }
      case 9: {  // a number replaced by a huge or boundary one
        static const char* const kNumbers[] = {
            "0",      "-1",   "65536", "2147483648", "18446744073709551616", "1e309", "-9223372036854775809",
            "1e-400", "0.1e1"};
        const auto [from, to] = NumberAt(b, Pos(b));
        b.erase(b.begin() + static_cast<ptrdiff_t>(from), b.begin() + static_cast<ptrdiff_t>(to));
        if (rng_.OneIn(3))
          Insert(b, from, "9", 20 + rng_.Below(rng_.OneIn(4) ? 5000 : 400));
        else
          Insert(b, from, kNumbers[rng_.Below(std::size(kNumbers))]);
        break;
      }
      case 10: {  // a short range repeated many times (long arrays, long strings)
        if (b.empty()) break;
        const size_t from = rng_.Below(b.size());
        const size_t n = 1 + rng_.Below(std::min<size_t>(b.size() - from, 32));
        const std::string chunk(b.begin() + static_cast<ptrdiff_t>(from), b.begin() + static_cast<ptrdiff_t>(from + n));
        Insert(b, from, chunk, 2 + rng_.Below(rng_.OneIn(8) ? 20000 : 100));
        break;
      }
      case 11:  // truncate
        b.resize(Pos(b));
        break;
      case 12: {  // swap two bytes
        if (b.size() < 2) break;
        std::swap(b[rng_.Below(b.size())], b[rng_.Below(b.size())]);
        break;
      }
      case 13:
      case 14: {  // a token replaced by another, as it is
        const auto [from, to] = TokenAt(b, Pos(b));
        b.erase(b.begin() + static_cast<ptrdiff_t>(from), b.begin() + static_cast<ptrdiff_t>(to));
        Insert(b, from, tokens_[rng_.Below(tokens_.size())]);
        break;
      }
      case 15:
      case 16:
      case 17: {  // a value or key replaced by a token made a JSON value (a key by a string): the text
                  // stays well formed
        const auto [from, to] = TokenAt(b, Pos(b));
        const bool key = IsKey(b, to);
        std::string value = AsValue(tokens_[rng_.Below(tokens_.size())]);
        if (key && value[0] != '"') value = "\"" + value + "\"";
        b.erase(b.begin() + static_cast<ptrdiff_t>(from), b.begin() + static_cast<ptrdiff_t>(to));
        Insert(b, from, value);
        break;
      }
      case 18: {  // an array's element duplicated (a node described twice, more links)
        const auto [from, to] = ElementAt(b, Pos(b));
        if (to == 0 || (structural && !InArray(b, from))) break;
        const std::string element(b.begin() + static_cast<ptrdiff_t>(from), b.begin() + static_cast<ptrdiff_t>(to));
        Insert(b, to, ", " + element, rng_.OneIn(8) ? 1 + rng_.Below(1000) : 1);
        break;
      }
      case 19: {  // an array's bracketed element removed, with the comma after it
        const auto [from, to] = ElementAt(b, Pos(b));
        if (to == 0 || (structural && !InArray(b, from))) break;
        size_t end = to;
        while (end < b.size() && (b[end] == ' ' || b[end] == '\n')) ++end;
        if (end < b.size() && b[end] == ',') ++end;
        b.erase(b.begin() + static_cast<ptrdiff_t>(from), b.begin() + static_cast<ptrdiff_t>(end));
        break;
      }
    }
  }

  const std::vector<Bytes>& corpus_;
  const std::vector<std::string> tokens_;
  const size_t max_len_;
  Rng rng_;
  Bytes last_;
};

}  // namespace kizuna::fuzz
