// kizuna's version: the library's (libkizuna.so.MAJOR), the C API's (kizuna.h's KZ_MAJOR... must
// agree: runtime/c_api.cc checks) and what ranks compare when they form a communicator. The major
// is the ABI's: ranks of different majors refuse to form a communicator, and an install's soname
// carries it.
#pragma once

#include <string>

namespace kizuna {

struct Version {
  int major = 0;
  int minor = 0;
  int patch = 0;
};

inline constexpr Version kVersion{1, 1, 0};

inline std::string VersionString(const Version& v) {
  return std::to_string(v.major) + "." + std::to_string(v.minor) + "." + std::to_string(v.patch);
}

}  // namespace kizuna
