// GoogleTest assertions on Status and Result that print the whole Status on failure; like gtest's
// own, they accept `<< "more context"`. (The switch guards against a dangling else, as gtest's
// macros do.) For tests only: the device and fabric conformance suites and the components' tests.
#pragma once

#include <utility>

#include <gtest/gtest.h>

#include "runtime/core/status.h"

#define KZ_EXPECT_OK(expr)                                   \
  switch (0)                                                 \
  case 0:                                                    \
  default:                                                   \
    if (const ::kizuna::Status kz_s_ = (expr); kz_s_.ok()) { \
    } else                                                   \
      ADD_FAILURE() << #expr << " -> " << kz_s_.ToString() << ": "
#define KZ_ASSERT_OK(expr)                                   \
  switch (0)                                                 \
  case 0:                                                    \
  default:                                                   \
    if (const ::kizuna::Status kz_s_ = (expr); kz_s_.ok()) { \
    } else                                                   \
      FAIL() << #expr << " -> " << kz_s_.ToString() << ": "
#define KZ_EXPECT_CODE(expr, code_value)                                                                            \
  switch (0)                                                                                                        \
  case 0:                                                                                                           \
  default:                                                                                                          \
    if (const ::kizuna::Status kz_s_ = (expr); kz_s_.code() == (code_value)) {                                      \
    } else                                                                                                          \
      ADD_FAILURE() << #expr << " -> " << kz_s_.ToString() << " (expected " << ::kizuna::StatusCodeName(code_value) \
                    << ")"
// `KZ_ASSERT_OK_AND_ASSIGN(auto x, MakeX());` in a test: fails the test when not ok.
#define KZ_ASSERT_OK_AND_ASSIGN(lhs, expr) \
  KZ_ASSERT_OK_AND_ASSIGN_IMPL_(KZ_CONCAT_(kz_test_result_, __LINE__), lhs, expr)
#define KZ_ASSERT_OK_AND_ASSIGN_IMPL_(tmp, lhs, expr)                  \
  auto tmp = (expr);                                                   \
  ASSERT_TRUE(tmp.ok()) << #expr << " -> " << tmp.status().ToString(); \
  lhs = std::move(tmp).value()
