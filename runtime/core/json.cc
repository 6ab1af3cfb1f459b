#include "runtime/core/json.h"

#include <algorithm>

#include <fmt/format.h>

namespace kizuna {
namespace {

using Json = nlohmann::json;

// nlohmann's message quotes the token it was reading ("...; last read: '<token>'; expected ..."),
// however long, with each control character as <U+000A> (9 bytes): cut the token to a few dozen
// bytes, so that the message stays proportionate to the input and one line.
std::string ShortenLastRead(std::string message) {
  constexpr std::string_view kLastRead = "last read: '";
  constexpr size_t kShown = 40;
  const size_t start = message.find(kLastRead);
  if (start == std::string::npos) return message;
  const size_t token = start + kLastRead.size();
  size_t end = message.rfind("'; expected ");
  if (end == std::string::npos || end < token) end = message.rfind('\'');
  if (end == std::string::npos || end < token) end = message.size();
  if (end - token <= kShown) return message;
  size_t cut = token + kShown;
  while (cut > token && (static_cast<unsigned char>(message[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
  if (const size_t open = message.rfind('<', cut);
      open != std::string::npos && open >= token && message.find('>', open) >= cut)
    cut = open;  // not inside a <U+000A>
  return message.substr(0, cut) + "..." + message.substr(end);
}

// Checks the text without building a tree: captures the syntax error (position and message), and
// stops at the first container deeper than the limit.
class Checker : public nlohmann::json_sax<Json> {
 public:
  explicit Checker(int max_depth) : max_depth_(max_depth) {}

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return Enter(); }
  bool key(string_t&) override { return true; }
  bool end_object() override { return Leave(); }
  bool start_array(std::size_t) override { return Enter(); }
  bool end_array() override { return Leave(); }
  bool parse_error(std::size_t position, const std::string& last_token,
                   const nlohmann::detail::exception& ex) override {
    position_ = position;
    last_token_ = last_token;
    // "[json.exception.parse_error.101] parse error at line 3, column 5: syntax error ..." — keep
    // what follows the location; the location is recomputed from the byte position.
    std::string what = ex.what();
    const size_t colon = what.find(": ");
    message_ = ShortenLastRead(colon == std::string::npos ? what : what.substr(colon + 2));
    return false;
  }

  bool too_deep() const { return too_deep_; }
  size_t position() const { return position_; }
  const std::string& last_token() const { return last_token_; }
  const std::string& message() const { return message_; }

 private:
  bool Enter() {
    if (++depth_ <= max_depth_) return true;
    too_deep_ = true;
    return false;
  }
  bool Leave() {
    --depth_;
    return true;
  }

  int max_depth_;
  int depth_ = 0;
  bool too_deep_ = false;
  size_t position_ = 0;
  std::string last_token_;
  std::string message_;
};

// The offset of the bracket that opens level `level` (1-based). The text before it is valid JSON
// (the checker stopped there), so counting brackets outside strings is exact.
size_t OpeningOfLevel(std::string_view text, int level) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth == level) return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return text.size();
}

void AppendExcerpt(const Json& j, int depth, size_t budget, std::string& out) {
  constexpr int kShownLevels = 8;
  auto scalar = [&](const Json& v) { out += v.dump(-1, ' ', false, Json::error_handler_t::replace); };
  if (!j.is_structured()) {
    if (j.is_string() && j.get_ref<const std::string&>().size() > budget) {
      scalar(Json(j.get_ref<const std::string&>().substr(0, budget)));  // cut anyway below
      return;
    }
    scalar(j);
    return;
  }
  const bool array = j.is_array();
  if (j.empty()) {
    out += array ? "[]" : "{}";
    return;
  }
  if (depth >= kShownLevels) {
    out += array ? "[...]" : "{...}";
    return;
  }
  out += array ? '[' : '{';
  bool first = true;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (out.size() > budget) break;
    if (!first) out += ',';
    first = false;
    if (!array) {
      scalar(Json(it.key()));
      out += ':';
    }
    AppendExcerpt(*it, depth + 1, budget, out);
  }
  out += array ? ']' : '}';
}

}  // namespace

LineIndex::LineIndex(std::string_view text) : size_(text.size()) {
  starts_.push_back(0);
  for (size_t i = 0; i < text.size(); ++i)
    if (text[i] == '\n') starts_.push_back(i + 1);
}

LineColumn LineIndex::At(size_t offset) const {
  offset = std::min(offset, size_);
  // The last line start at or before offset.
  const auto it = std::upper_bound(starts_.begin(), starts_.end(), offset) - 1;
  return LineColumn{static_cast<int>(it - starts_.begin()) + 1, static_cast<int>(offset - *it) + 1};
}

Result<Json> ParseJson(std::string_view text, std::string_view source, int max_depth) {
  Checker checker(max_depth);
  if (!Json::sax_parse(text.begin(), text.end(), &checker)) {
    if (checker.too_deep()) {
      const LineColumn lc = LineIndex(text).At(OpeningOfLevel(text, max_depth + 1));
      return InvalidArgument(
          fmt::format("{}:{}:{}: nesting deeper than {} levels", source, lc.line, lc.column, max_depth));
    }
    // nlohmann reports the byte after the offending token: point at the token's start when the
    // token is the text just before that. At the end of the input it counts the end as one more
    // byte, and its token is the last one read: the end itself is the place to name.
    size_t at = checker.position();
    const std::string& token = checker.last_token();
    if (at > text.size()) {
      at = text.size();
    } else if (!token.empty() && at >= token.size() && text.substr(at - token.size(), token.size()) == token) {
      at -= token.size();
    }
    const LineColumn lc = LineIndex(text).At(at);
    return InvalidArgument(fmt::format("{}:{}:{}: invalid JSON: {}", source, lc.line, lc.column, checker.message()));
  }
  Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument(fmt::format("{}: invalid JSON", source));  // the checker passed it
  return j;
}

std::string JsonExcerpt(const Json& value, size_t max_chars) {
  max_chars = std::max<size_t>(max_chars, 8);
  std::string out;
  AppendExcerpt(value, 0, max_chars, out);
  if (out.size() <= max_chars) return out;
  size_t cut = max_chars - 3;
  while (cut > 0 && (static_cast<unsigned char>(out[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 character
  out.resize(cut);
  return out + "...";
}

}  // namespace kizuna
