// What a fuzz target asserts beyond "does not crash": a failed check prints the condition and why,
// then aborts, so that the driver (driver.cc) or libFuzzer saves the input.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "runtime/core/status.h"

namespace kizuna::fuzz {

[[noreturn]] inline void CheckFailed(const char* file, int line, const char* condition, const std::string& why) {
  std::fprintf(stderr, "%s:%d: check failed: %s\n  %s\n", file, line, condition, why.c_str());
  std::fflush(stderr);
  std::abort();
}

inline std::string_view AsText(const uint8_t* data, size_t size) { return {reinterpret_cast<const char*>(data), size}; }

// Errors are values: what a parser refuses is kInvalidArgument with a message that names the
// problem, and the message stays proportionate to the input (no value printed whole, no value
// printed per level of nesting).
inline void CheckRefusal(const Status& s, size_t input_size, const char* file, int line) {
  if (s.code() != StatusCode::kInvalidArgument)
    CheckFailed(file, line, "code == kInvalidArgument", "refused with " + s.ToString());
  if (s.message().empty()) CheckFailed(file, line, "!message.empty()", "refused without a message");
  if (s.message().size() > 2 * input_size + 1024)
    CheckFailed(file, line, "message size proportionate to the input",
                std::to_string(s.message().size()) + " bytes of message for " + std::to_string(input_size) +
                    " bytes of input: " + s.message().substr(0, 300));
}

}  // namespace kizuna::fuzz

#define KZ_FUZZ_CHECK(condition, why)                                                     \
  do {                                                                                    \
    if (!(condition)) ::kizuna::fuzz::CheckFailed(__FILE__, __LINE__, #condition, (why)); \
  } while (0)

#define KZ_FUZZ_CHECK_REFUSAL(status, input_size) \
  ::kizuna::fuzz::CheckRefusal((status), (input_size), __FILE__, __LINE__)
