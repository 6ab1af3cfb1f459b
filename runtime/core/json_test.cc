#include "runtime/core/json.h"

#include <pthread.h>

#include <functional>
#include <string>

#include <gtest/gtest.h>

namespace kizuna {
namespace {

using Json = nlohmann::json;

// Runs `f` on a thread with a small stack (as a library's caller may have), so that recursion
// proportional to the input's nesting fails here rather than only on a deeper input.
void OnSmallStack(const std::function<void()>& f) {
  pthread_attr_t attr;
  ASSERT_EQ(pthread_attr_init(&attr), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, 256 << 10), 0);
  pthread_t t;
  auto* fn = new std::function<void()>(f);
  ASSERT_EQ(pthread_create(
                &t, &attr,
                [](void* p) -> void* {
                  auto* g = static_cast<std::function<void()>*>(p);
                  (*g)();
                  delete g;
                  return nullptr;
                },
                fn),
            0);
  pthread_join(t, nullptr);
  pthread_attr_destroy(&attr);
}

TEST(ParseJsonTest, ParsesValidText) {
  Result<Json> j = ParseJson("{\"a\": [1, 2, {\"b\": null}]}", "t.json");
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  EXPECT_EQ((*j)["a"][1], 2);
}

TEST(ParseJsonTest, SyntaxErrorsNameLineAndColumn) {
  Result<Json> j = ParseJson("{\n  \"a\": 1\n  \"b\": 2\n}", "t.json");
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(j.status().message().rfind("t.json:3:3: invalid JSON: ", 0), 0u) << j.status().message();
  // At the end of the input, the end is the place.
  Result<Json> truncated = ParseJson("{\"a\": [1,", "t.json");
  ASSERT_FALSE(truncated.ok());
  EXPECT_EQ(truncated.status().message().rfind("t.json:1:10: invalid JSON: ", 0), 0u) << truncated.status().message();
  Result<Json> empty = ParseJson("", "e.json");
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().message().rfind("e.json:1:1: invalid JSON: ", 0), 0u) << empty.status().message();
}

// nlohmann's message quoted the whole token it was reading, each newline as <U+000A> (9 bytes): 6 KB
// of input gave an 18 KB message.
TEST(ParseJsonTest, MessagesQuoteAShortPartOfTheToken) {
  Result<Json> j = ParseJson("[1]" + std::string(6000, '\n') + "x", "t.json");
  ASSERT_FALSE(j.ok());
  EXPECT_LT(j.status().message().size(), 300u) << j.status().message();
  EXPECT_NE(j.status().message().find(
                "invalid literal; last read: '1]<U+000A><U+000A><U+000A><U+000A>...'; expected end of input"),
            std::string::npos)
      << j.status().message();
  const std::string long_string = "[\"" + std::string(10000, 'x') + "\\u12\"]";
  j = ParseJson(long_string, "t.json");
  ASSERT_FALSE(j.ok());
  EXPECT_LT(j.status().message().size(), 300u) << j.status().message();
}

TEST(ParseJsonTest, NestingAtTheLimitIsAccepted) {
  const std::string text = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_TRUE(ParseJson(text, "t.json").ok());
}

// A 200 KB file of 75,000 nested brackets: refused before a tree is built, at the bracket that
// opens level 65, on a small stack.
TEST(ParseJsonTest, DeeperNestingIsRefusedWhereItStarts) {
  for (const std::string& open : {std::string("["), std::string("{\"k\":")}) {
    std::string text = "{\"nodes\":\n  ";
    for (int i = 0; i < 75000; ++i) text += open;
    Result<Json> j = Status(StatusCode::kInternal, "not run");
    OnSmallStack([&] { j = ParseJson(text, "t.json"); });
    ASSERT_FALSE(j.ok());
    EXPECT_EQ(j.status().message(),
              "t.json:2:" + std::to_string(3 + 63 * static_cast<int>(open.size())) + ": nesting deeper than 64 levels");
  }
  // Brackets inside strings do not count.
  const std::string quoted = "[\"" + std::string(100, '[') + "\"]";
  EXPECT_TRUE(ParseJson(quoted, "t.json").ok());
}

TEST(JsonExcerptTest, SmallValuesPrintAsDump) {
  for (const char* text : {"1", "\"w0\"", "[1,2,3]", "{\"a\":\"w0:0\",\"b\":[true,null]}", "[]", "{}", "-1.5"}) {
    const Json j = Json::parse(text);
    EXPECT_EQ(JsonExcerpt(j), j.dump()) << text;
  }
}

TEST(JsonExcerptTest, LongAndDeepValuesAreCut) {
  Json wide = Json::array();
  for (int i = 0; i < 100000; ++i) wide.push_back(i);
  const std::string w = JsonExcerpt(wide);
  EXPECT_EQ(w.size(), 120u);
  EXPECT_EQ(w.substr(0, 8), "[0,1,2,3");
  EXPECT_EQ(w.substr(117), "...");
  EXPECT_EQ(JsonExcerpt(Json(std::string(1 << 20, 'x'))).size(), 120u);

  // Deeper than JsonExcerpt shows, built without recursion; printed on a small stack.
  Json deep = Json::array();
  for (int i = 0; i < 10; ++i) deep = Json::array({std::move(deep)});
  std::string d;
  OnSmallStack([&] { d = JsonExcerpt(deep); });
  EXPECT_EQ(d, "[[[[[[[[[...]]]]]]]]]");
}

TEST(LineIndexTest, LinesAndColumns) {
  const LineIndex index("ab\ncd\n\nef");
  EXPECT_EQ(index.At(0).line, 1);
  EXPECT_EQ(index.At(0).column, 1);
  EXPECT_EQ(index.At(2).column, 3);  // the newline itself
  EXPECT_EQ(index.At(3).line, 2);
  EXPECT_EQ(index.At(7).line, 4);
  EXPECT_EQ(index.At(8).column, 2);
  EXPECT_EQ(index.At(1000).line, 4);  // clamped to the end
  EXPECT_EQ(index.At(1000).column, 3);
  EXPECT_EQ(LineIndex("").At(0).line, 1);
}

}  // namespace
}  // namespace kizuna
